"""segscope wire formats, Python side. Each module mirrors one C header in schemas/c/."""
