"""RQ jobs: module-level functions of primitive arguments, safe to run twice."""
