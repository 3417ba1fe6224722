"""Eight prompts of mixed lengths (1 to 11 tokens, one of repeats): the batch of every equivalence test."""

PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11, 12],
    [13],
    [14, 15, 16],
    [17, 18, 19, 20, 21, 22],
    [23, 24],
    [25] * 11,
    [26, 27],
    [28],
]
