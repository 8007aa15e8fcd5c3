"""Code written as a user of steprl would write it, from the README alone: two envs (a stochastic
choice task, a grid walk with a text map), trained by tests and `configs/learn_general.yaml`, and
an OpenAI-SDK calculator agent trained through the policy server."""
