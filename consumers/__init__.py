"""Query-side consumers: questions in, answers with evidence out."""
