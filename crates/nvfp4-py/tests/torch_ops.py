"""What the tests of ``torch.ops.nvfp4.*`` need to know about the kernels serving them."""

import os


def native(name):
    """Whether operator ``name`` runs on nvfp4's native boxed kernel (``nvfp4.torch.NATIVE_KERNELS``)."""
    import nvfp4.torch as nvt

    return name in nvt.NATIVE_KERNELS


def op_error(name, kind):
    """The exception a refused call of operator ``name`` raises: RuntimeError from its native
    kernel (torch's type for an operator's refusal; the message starts with the operation's own
    type, ``ValueError: ...``), ``kind`` itself from its Python kernel."""
    return RuntimeError if native(name) else kind


PYTHON_KERNELS_ENV = dict(os.environ, NVFP4_TORCH_NATIVE_KERNELS="0")
