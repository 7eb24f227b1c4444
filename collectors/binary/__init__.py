"""ELF, call-frame information (CFI) and symbols of the objects a process maps."""
