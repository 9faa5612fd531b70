def shout(value):
    return value.upper()
