"""mrdbourke/pytorch-deep-learning 01_pytorch_workflow.ipynb: a notebook: linear regression on data made in the
notebook, a train/test loop that prints every 10 epochs, save and load of the state_dict."""

from _recipe import Recipe, Substitution

NOTEBOOK = "01_pytorch_workflow.ipynb"

RECIPE = Recipe(
    name="mrdbourke_workflow",
    repo="mrdbourke/pytorch-deep-learning",
    entry=NOTEBOOK,
    style="notebook (course), regression",
    keep=(NOTEBOOK,),
    substitutions=(Substitution(NOTEBOOK, "epochs = 1000 ", "epochs = 60 "), Substitution(NOTEBOOK, "epochs = 100\\n", "epochs = 40\\n")),
    loss_regex=r"Train [Ll]oss: (?:tensor\()?([-+\d.e]+|nan|inf)",
    timeout=300,
)
