"""A no-op stand-in for the old tensorboard_logger package (the real-programs suite)."""


class Logger:
    def __init__(self, *args, **kwargs):
        pass

    def log_value(self, *args, **kwargs):
        pass


def configure(*args, **kwargs):
    pass


def log_value(*args, **kwargs):
    pass
