"""Plans: the data model, validation, JSON schema, baselines, random plans and moves."""
