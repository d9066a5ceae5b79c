"""A stand-in for wandb (the real-programs suite: no account, no network).

``log`` prints its scalars on stdout (``wandb.log {'train loss': 0.6931, 'step': 1}``), as a dashboard would
show them, so a program that reports its loss only through wandb still has a loss curve to compare; numbers
and one-element tensors are read as the real client reads them. Everything else does nothing.
"""


class _Nothing:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return _Nothing()

    def __call__(self, *args, **kwargs):
        return _Nothing()

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())


def _scalar(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            if hasattr(value, "numel") and value.numel() == 1:
                return float(value.item())
        except Exception:
            return None
        return None if isinstance(value, bool) or not isinstance(value, (int, float)) else value
    return value


def log(data=None, step=None, commit=None, **kwargs):
    shown = {}
    for key, value in (data or {}).items():
        number = _scalar(value)
        if number is not None:
            shown[key] = round(number, 6) if isinstance(number, float) else number
    if shown:
        print(f"wandb.log {shown}", flush=True)


class _Run(_Nothing):
    def log(self, data=None, step=None, commit=None, **kwargs):
        log(data, step, commit)


def init(*args, **kwargs):
    return _Run()


run = None
config = _Nothing()
Histogram = Image = Table = Video = Audio = _Nothing


def finish(*args, **kwargs):
    pass


def __getattr__(name):
    return _Nothing()
