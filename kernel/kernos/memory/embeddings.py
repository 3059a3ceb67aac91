"""Whether recall also matches by meaning: the embedding model, set by the human in the image.

:class:`EmbeddingConfig` lives at the system name :data:`CONFIG_NAME`
(``kernos:embeddings``), bound by ``agents.memory_embeddings(model, ...)``
in the running op: it commits and rolls back with that op, and ``None``
removes it (embeddings off).  Agents cannot set it: they have no ``agents``
object, and ``write()`` takes identifiers only, never a ``kernos:`` name.

It is not under the facts' prefix (``kernos:memory:<principal>``), so no
agent's name can collide with it.

Nothing here imports Jupyter, numpy or a model client.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernos.errors import UsageError

__all__ = ["CONFIG_NAME", "EMBED_PER_RECALL", "MAX_DIMENSIONS", "EmbeddingConfig",
           "check_config"]

CONFIG_NAME = "kernos:embeddings"
EMBED_PER_RECALL = 32
"""Entries without a vector embedded per recall at most (newest first): a bounded cost."""
MAX_DIMENSIONS = 8192
EMBED_TEXT_CHARS = 8192
"""An entry's text sent to the model is cut to this (embedding models take a few
thousand tokens)."""


@dataclass(frozen=True, kw_only=True)
class EmbeddingConfig:
    """The memory's embedding model (stored in the image; plain values only)."""

    model: str
    """The model, as litellm names it (the principal needs ``llm:MODEL`` to recall)."""
    dimensions: int | None = None
    """The vectors' size asked of the model; None: the model's own."""
    mock_response: tuple[float, ...] | None = None
    """A fixed vector the model call answers with (offline tests and demos)."""

    def params(self) -> dict[str, Any] | None:
        """The parameters of each embedding call."""
        found: dict[str, Any] = {}
        if self.dimensions is not None:
            found["dimensions"] = self.dimensions
        if self.mock_response is not None:
            found["mock_response"] = list(self.mock_response)
        return found or None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "dimensions": self.dimensions,
                "mock_response": None if self.mock_response is None
                else list(self.mock_response)}


OFF: dict[str, Any] = {"model": None, "dimensions": None, "mock_response": None}
"""What ``agents.memory_embeddings(None)`` returns."""


def check_config(model: object, dimensions: object = None,
                 mock_response: object = None) -> EmbeddingConfig | None:
    """The config for these arguments (checked by exact type, bounded), or None for off."""
    from kernos.llm._request import MODEL_PATTERN

    if model is None:
        if dimensions is not None or mock_response is not None:
            raise UsageError("memory_embeddings(None) turns embeddings off and takes no "
                             "dimensions or mock_response")
        return None
    if type(model) is not str or not MODEL_PATTERN.fullmatch(model):
        raise UsageError(f"memory_embeddings() takes a model name as litellm spells it "
                         f"(e.g. 'text-embedding-3-small'), not {str(model)[:80]!r}")
    if dimensions is not None and (type(dimensions) is not int
                                   or not 1 <= dimensions <= MAX_DIMENSIONS):
        raise UsageError(f"dimensions must be an int from 1 to {MAX_DIMENSIONS} (or None for "
                         f"the model's own), not {str(dimensions)[:40]!r}")
    vector: tuple[float, ...] | None = None
    if mock_response is not None:
        if (type(mock_response) not in (list, tuple)
                or not 1 <= len(mock_response) <= MAX_DIMENSIONS  # type: ignore[arg-type]
                or not all(type(x) in (int, float) and math.isfinite(x)
                           for x in mock_response)):  # type: ignore[attr-defined]
            raise UsageError(f"mock_response must be a list of 1 to {MAX_DIMENSIONS} finite "
                             "numbers (the vector every embedding call answers)")
        vector = tuple(float(x) for x in mock_response)  # type: ignore[attr-defined]
        if dimensions is not None and len(vector) != dimensions:
            raise UsageError(f"mock_response has {len(vector)} numbers but dimensions is "
                             f"{dimensions}: give as many as dimensions says")
    return EmbeddingConfig(model=model, dimensions=dimensions, mock_response=vector)
