"""The steps a reply is made of, each behind one interface: `runner.step(reply, gen, setup)` yields
the step's StepMetrics (and a batched step's BatchStats) and then the tokens it produced.

`PlainSteps` (plain.py): batch 1 on the engine's own KV cache. `SpeculativeSteps` (speculative.py):
a draft source guesses, one plain step verifies. `BatchedSteps` (batched.py): the reply as one request
of the batch server, beside the simulated users. `Reply` (reply.py) is one reply's accounting,
whichever runner runs its steps; timing.py times a step and numbers them."""
