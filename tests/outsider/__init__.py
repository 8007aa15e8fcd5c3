"""Two envs written as a user of steprl would write them, from the README alone: a stochastic
choice task and a grid walk with a text map. Tests and `configs/learn_general.yaml` train them."""
