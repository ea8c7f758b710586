"""The CUDA paths of a training step, run on the meta device of this CPU: the router lives in
ablate.predict.meta_cuda (the GPU memory plan traces with it); the tests import it from here."""

from ablate.predict.meta_cuda import CudaKernels, cuda_kernel, sdpa_on_meta  # noqa: F401
