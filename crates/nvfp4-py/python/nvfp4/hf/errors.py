"""The one error type of ``nvfp4.hf``."""


class CheckpointError(ValueError):
    """A checkpoint ``nvfp4.hf`` cannot load as it is: a quantization it does not implement (its
    ``quant_algo``, group size or number format), tensors missing or of the wrong dtype or shape,
    or a model layout it does not map (experts stored another way, an activation other than SiLU).
    The message names the checkpoint entries or modules concerned."""
