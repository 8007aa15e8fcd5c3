"""The python sandbox's parts apart from the tool: what runs inside the sandbox before the program
(launcher) and what a call uses, seen from the host (watch).
"""
