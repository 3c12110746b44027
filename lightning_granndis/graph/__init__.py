"""graph algorithms (plain torch): see the project's open issues."""
