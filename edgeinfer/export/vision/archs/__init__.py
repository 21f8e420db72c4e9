"""Small network architectures written here for weights that ship without their code (a
recipe's ``[vision] factory``); each matches its weights' state-dict names exactly."""
