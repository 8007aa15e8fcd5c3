"""Reading the model's text: the Hermes tool-call format and final-answer extraction and
comparison.
"""
