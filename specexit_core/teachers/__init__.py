"""Built-in teachers beyond the toy: realistic reasoning text for real vocabularies (issue #13)."""
