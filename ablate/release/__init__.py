"""Release: one finished run as a Hugging Face folder (`ablate export`): the weights and tokenizer (export), the
model card written from the run's records and scores (card, provenance), and the push to the hub (hub).

May import: config, store, data, models, plan, analysis, train, evaluate, report.
"""
