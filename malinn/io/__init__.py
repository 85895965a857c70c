"""Files and streams: writing a file without harm (old or complete, never half-written), reading the
input arrays a user hands to the command line, the per-user cache folder and its checked entries,
and ``-`` as standard input and output."""
