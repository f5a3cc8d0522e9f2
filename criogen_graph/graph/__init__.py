"""The compiled agent graph (`compiled`) and its nodes: `model`, `approval`, `tools`, with
what they share (`spec`, `state`, `events`, `segment`, `context`, `model_call`,
`hook_actions`)."""
