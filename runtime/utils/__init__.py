"""Helpers for migrated scripts (TorchAcc's ``torchacc.runtime.utils.misc``)."""

from accrewrite.runtime.utils.misc import multi_apply_multi_stream

__all__ = ["multi_apply_multi_stream"]
