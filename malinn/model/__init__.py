"""Models: Sequential and Functional with Keras's API (predict, summary, weights), and malinn model
files."""
