"""The answering modes, one module each: `fast` (one master call over the best memory), `deep`
(E-mem: router, assistants in parallel, master) and `agentic` (REMem-I: a bounded tool loop).
Each returns a :class:`~epistream.consumers.modes.base.ModeResult`; consumers/answer.py turns it into the
`Answer` message."""
