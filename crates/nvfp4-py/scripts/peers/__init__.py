"""The peer bench's parts (bench_peers.py is the program): cases, tolerance and report are pure
(NumPy at most) and tested on the CPU; the rest needs torch, and timing a GPU."""
