import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tests/models.py
os.environ.setdefault("MUJOCO_GL", "disable")
