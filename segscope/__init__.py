"""segscope: glue that runs the whole pipeline on one machine (demo and end-to-end tests)."""
