def register(command):
    pass
