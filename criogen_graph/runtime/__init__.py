"""The run: how a `Thread` drives the compiled graph through one run segment (`runner`),
what it pins (`pins`) and how it reads a typed output (`output`)."""
