"""Checks of a bundle against what will run it: today, which graph operators have a kernel on a GPU target."""
