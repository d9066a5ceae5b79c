"""What the script holds, read once before the rules run: facts, the step model, the project index,
CUDA paths and name resolution."""
