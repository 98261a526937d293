"""What the user sees of a run: console views, the loss plot, TensorBoard event files."""
