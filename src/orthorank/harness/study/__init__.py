"""The paper's whole study for one model (`orthorank study`): stages built from the commands, claims computed from
their intervals, one report per study and a summary across studies."""
