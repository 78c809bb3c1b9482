"""The text templates of the strategies: `str.format` strings with plain named fields only.

    check_template("critique_template", template, required={"answer"}, allowed={"question", "answer"})
    template_fields("reasoning.template", "{question} {{literal}}")   # {"question"}

A template may come from a request (self-refine's critique_template through `metagen serve`), so
anything but a plain `{name}` is refused before it is filled: a format spec pads to any width
(`{answer:a>20000000}` makes 20 MB per fill), a conversion or an attribute or index reads into
the value's object (`{answer.__class__}`), a positional field has no value. Literal braces are
written `{{` and `}}`. Filling a checked template costs O(template + values).
"""

from __future__ import annotations

from string import Formatter


def template_fields(name: str, template: object) -> set[str]:
    """The field names of `template`; ValueError naming `name` (the option holding it) unless it
    is a string whose every replacement field is a plain name."""
    if not isinstance(template, str):
        raise ValueError(f"{name}={template!r} is not a string: a template is text with {{field}} names")
    try:
        parsed = list(Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"{name}={template!r} is not a valid format template ({error})") from None
    found = set()
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        written = "{" + field + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
        problem = ("a conversion" if conversion else "a format spec" if spec
                   else "an attribute or index" if any(mark in field for mark in ".[")
                   else "a positional field" if field == "" or field.isdigit() else None)
        if problem is not None:
            raise ValueError(f"{name}={template!r} has {problem} in {written}: a template takes plain named fields "
                             "only, such as {answer} (no format spec, conversion, attribute, index or position; "
                             "literal braces are written {{ and }})")
        found.add(field)
    return found


def check_template(name: str, template: object, required: set[str], allowed: set[str]) -> None:
    """ValueError naming `name` unless `template` has plain named fields only (`template_fields`),
    among `allowed` and including `required`."""
    found = template_fields(name, template)
    fields_text = ", ".join("{" + f + "}" for f in sorted(allowed))
    problems = [f"{kind} fields {sorted(names)}" for kind, names in
                (("unknown", found - allowed), ("missing", required - found)) if names]
    if problems:
        required_text = f", with {', '.join('{' + f + '}' for f in sorted(required))} required" if required else ""
        raise ValueError(f"{name}={template!r} has {'; '.join(problems)}: fields must be among {fields_text}"
                         + required_text)
