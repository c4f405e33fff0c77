# Sourced by the GPU scripts on the device machine, after `dist` names the carried build folder:
#   lib_dirs PATTERN   the folders holding a library of the machine's (toolkit lib64 or a pip wheel's)
# and the environment every run there needs: our carried libraries first, then the machine's cuBLASLt,
# NCCL, cuDNN and CUDA runtime; NVLink multicast off (the device notes: it can take the host's GPUs out of
# service); mpirun as root.
lib_dirs() {
  find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib /opt /usr/local/lib -name "$1" \
    -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':'
}
# cuDNN (opened at run time by the cuDNN attention provider; on the device machine the copy in PyTorch's wheel)
# and the CUDA runtime its frontend opens beside laga's static one.
export LD_LIBRARY_PATH="$dist/libs:$(lib_dirs 'libcublasLt.so.13*')$(lib_dirs 'libnccl.so.2*')$(lib_dirs 'libcudnn.so.9')$(lib_dirs 'libcudart.so.13')${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
