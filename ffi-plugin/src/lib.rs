//! libnccl-net-tally.so: the NCCL network plugin. Its entry points arrive with
//! the NCCL plugin issue; until then the library builds and exports nothing.
