"""Privacy/utility/attack studies: a grid of training runs over options and seeds (``privfed study``)."""
