// A small JSON Schema check for edited tool arguments (the subset tool schemas use).
// The server validates again; this only tells the reviewer before sending.

const TYPES = {
  string: (v) => typeof v === "string",
  integer: (v) => Number.isInteger(v),
  number: (v) => typeof v === "number",
  boolean: (v) => typeof v === "boolean",
  object: (v) => v !== null && typeof v === "object" && !Array.isArray(v),
  array: (v) => Array.isArray(v),
  null: (v) => v === null,
};

/** Return the problems of `value` against `schema` as readable strings (empty when valid). */
export function validate(value, schema, path = "arguments") {
  if (!schema || typeof schema !== "object") return [];
  const problems = [];
  if (schema.anyOf || schema.oneOf) {
    const options = schema.anyOf || schema.oneOf;
    if (!options.some((s) => validate(value, s, path).length === 0)) problems.push(`${path} matches none of the allowed forms`);
    return problems;
  }
  const types = schema.type ? [].concat(schema.type) : null;
  if (types && !types.some((t) => TYPES[t] && TYPES[t](value))) {
    return [`${path} must be ${types.join(" or ")}`];
  }
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) problems.push(`${path} must be one of ${schema.enum.map((e) => JSON.stringify(e)).join(", ")}`);
  if (typeof value === "string") {
    if (schema.minLength !== undefined && value.length < schema.minLength) problems.push(`${path} must have at least ${schema.minLength} characters`);
    if (schema.maxLength !== undefined && value.length > schema.maxLength) problems.push(`${path} must have at most ${schema.maxLength} characters`);
  }
  if (typeof value === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) problems.push(`${path} must be at least ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) problems.push(`${path} must be at most ${schema.maximum}`);
  }
  if (TYPES.object(value) && (schema.properties || schema.required)) {
    for (const name of schema.required || []) if (!(name in value)) problems.push(`${path}.${name} is required`);
    for (const [name, v] of Object.entries(value)) {
      if (schema.properties && name in schema.properties) problems.push(...validate(v, schema.properties[name], `${path}.${name}`));
      else if (schema.additionalProperties === false) problems.push(`${path}.${name} is not an argument of this tool`);
    }
  }
  if (Array.isArray(value) && schema.items) value.forEach((v, i) => problems.push(...validate(v, schema.items, `${path}[${i}]`)));
  return problems;
}
