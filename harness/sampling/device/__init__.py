"""The device path: trials built and outputs tallied on the backend's GPU, bit for bit as on the host."""
