"""Tables, figures and frontiers of results: presentation, apart from the evaluation that computes them."""
