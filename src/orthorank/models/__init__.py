"""Model plumbing: loading (embedded GGUF, local folders, hub ids, random-weight shapes) and family adapters."""

from orthorank.models.adapters import FamilyAdapter, get_adapter, supported_families
from orthorank.models.loading import EMBEDDED_MODEL, LoadedModel, load_model

__all__ = ["EMBEDDED_MODEL", "FamilyAdapter", "LoadedModel", "get_adapter", "load_model", "supported_families"]
