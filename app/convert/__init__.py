"""Conversions between the HTTP schemas (``app/schemas``) and the core's types.

Routes and worker jobs both call these; neither imports the other (routes -> jobs -> core).
"""
