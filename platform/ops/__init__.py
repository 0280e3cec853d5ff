"""The operations layer: reading jobs, status, incidents, logs and stacks, and asking a job's
controller to act. The CLI, the web console and the kubectl plugin all go through it, so a job reads
the same and an action does the same whichever one an engineer uses. Plain functions over the store
and the diagnosis client, returning typed results and raising OpsError; nothing here prints or
renders: the CLI formats for the terminal, the console renders pages."""
