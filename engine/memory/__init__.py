"""Host memory for the device: allocations placed on the GPU's NUMA node (numa_memory.py, for
the host KV swap pool and the tensor-parallel workers) and index lists copied to the device
from pinned memory without waiting for the GPU (device_index.py)."""
