"""Result and option types of the built-in stages, one module per thing they describe.

Plain attrs classes without torch or jax, so the CLI can load, check and print results without heavy imports.
"""
