"""The adaptive controller: which drafter, and how much, pays for the batch at hand."""
