"""Python code generated from proto/ by ``make proto`` (never edited by hand).

``shared.contracts.aistack.v1`` holds aistack's own messages and the tuner
service; ``shared.contracts.inference`` holds the Open Inference Protocol.
Importing the latter registers the protobuf package ``inference``, as
tritonclient and kserve do, so a process that imports it must not import them.
"""
