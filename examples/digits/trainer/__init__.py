"""Example trainer package (the managed services' ``trainer/task.py`` shape)."""
