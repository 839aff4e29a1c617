"""NumPy and CuPy arrays as tensors: zero-copy views, so the reduction lands in the caller's array."""

import torch


def as_tensor(array) -> torch.Tensor:
    """A torch tensor sharing `array`'s memory, or TypeError when that is impossible."""
    if isinstance(array, torch.Tensor):
        return array
    if type(array).__module__ == "numpy" and type(array).__name__ == "ndarray":
        if not array.flags.writeable:
            raise TypeError("ringreduce reduces in place, and this NumPy array is read-only; pass a writable copy")
        try:
            return torch.from_numpy(array)
        except (TypeError, ValueError) as error:  # e.g. negative strides or an unsupported dtype
            raise TypeError(f"ringreduce cannot view this NumPy array as a tensor: {error}") from error
    if hasattr(array, "__dlpack__"):  # CuPy and other DLPack producers, on the CPU or a GPU
        return torch.from_dlpack(array)
    raise TypeError(
        f"ringreduce.all_reduce expects a torch.Tensor, a NumPy array or a DLPack array (CuPy), "
        f"got {type(array).__name__}"
    )
