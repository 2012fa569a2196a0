"""Graders: score a completion against the record it answers, in [0, 1]."""
