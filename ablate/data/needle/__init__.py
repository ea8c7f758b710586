"""The needle in a haystack, generated (the paper's long-context probe): a medical fact from one of eight
templates inserted into held-out corpus text at the start, middle or end, and a query that is the fact or a
distractor of the same template (templates.py: the templates and their lexicons, French and English;
generate.py: haystacks, records and splits from one seeded random.Random). The catalog's converter `needle`
(ablate/data/converters/needle.py) writes them as a dataset.

May import: config, data.
"""
