"""The feature head: an EAGLE-style drafter that reads the target's own hidden features."""
