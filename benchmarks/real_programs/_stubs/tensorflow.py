"""A no-op stand-in for tensorflow, which some PyTorch programs import only to write TensorBoard summaries
(the real-programs suite). Every name is a callable that does nothing."""


class _Nothing:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return _Nothing()

    def __call__(self, *args, **kwargs):
        return _Nothing()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def __getattr__(name):
    return _Nothing()
