"""/proc readers: the kernel's view of a process, read without stopping it."""
