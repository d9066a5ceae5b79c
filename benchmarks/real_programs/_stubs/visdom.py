"""A no-op stand-in for visdom (the real-programs suite: no visualisation server), which some programs import at
module level even when their visualisation flag is off. ``Visdom`` and every other name do nothing."""


class _Nothing:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return _Nothing()

    def __call__(self, *args, **kwargs):
        return _Nothing()


Visdom = _Nothing


def __getattr__(name):
    return _Nothing()
