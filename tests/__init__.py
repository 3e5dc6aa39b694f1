"""The suite, one folder per stage of the data path (as daemon/ is laid out); the helpers
(conftest, docgen, tinymodel, ...) stay here, imported as tests.docgen and so on."""
