"""The operator web console (`stalwart console`): jobs, incidents, logs and stacks, and the actions
on-call takes on a bad node, served as HTML by FastAPI from the same readers the CLI uses."""
